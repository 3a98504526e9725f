// Package jobname holds the one rule for a job's name, shared by node,
// overlay and gossip: the name goes into every protocol ID
// (/psp/<job>/step/1.0.0, ...) and the GossipSub topic (psp/<job>/updates/1),
// so it must be safe in both and the same everywhere a node checks it.
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
