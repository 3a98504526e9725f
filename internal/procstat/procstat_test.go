package procstat

import (
	"runtime"
	"testing"
	"time"
)

// The process started before now, and not long before: a test binary
// reaches its tests within minutes of its start.
func TestStartTime(t *testing.T) {
	st := StartTime()
	if runtime.GOOS != "linux" {
		if !st.IsZero() {
			t.Errorf("StartTime %v where /proc does not tell", st)
		}
		return
	}
	if age := time.Since(st); age < 0 || age > 10*time.Minute {
		t.Errorf("the process started %v ago (%v)", age, st)
	}
}
