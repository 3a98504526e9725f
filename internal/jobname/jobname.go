package jobname

import (
	"fmt"
	"regexp"
)

// MaxLen is the longest job name.
const MaxLen = 64

var re = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Validate reports whether name is a job name: 1 to 64 characters, each a
// letter, a digit, '.', '_' or '-'.
func Validate(name string) error {
	if !re.MatchString(name) {
		return fmt.Errorf("job %q: want 1-%d letters, digits, '.', '_' or '-'", name, MaxLen)
	}
	return nil
}
