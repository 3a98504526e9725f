package jobname

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"default", true},
		{"mnist-run_2.b", true},
		{strings.Repeat("a", MaxLen), true},
		{strings.Repeat("a", MaxLen+1), false},
		{"", false},
		{"a/b", false},
		{"a b", false},
		{"tab\t", false},
		{"crlf\r\n", false},
		{"ü", false},
	} {
		if err := Validate(tc.name); (err == nil) != tc.ok {
			t.Errorf("Validate(%q) = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}
