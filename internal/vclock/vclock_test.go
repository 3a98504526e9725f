package vclock

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// childEnv selects what the test binary does when a test re-runs it as a
// program that calls Exit (see TestMain).
const childEnv = "VCLOCK_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "sleep":
		Exit(context.Background(), func(ctx context.Context, c *Clock) int {
			v0 := time.Now()
			time.Sleep(time.Hour)
			fmt.Printf("virtual %v, wall under a minute %v, in bubble %v\n", time.Since(v0), c.Wall() < time.Minute, InBubble())
			return 7
		})
	case "cancel":
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		Exit(ctx, func(ctx context.Context, c *Clock) int {
			<-ctx.Done()
			fmt.Printf("cancelled: %v\n", ctx.Err())
			return 5
		})
	}
	os.Exit(m.Run())
}

// child runs this test binary as a program whose main calls Exit.
func child(t *testing.T, mode string) (string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// TestExitRunsOnTheVirtualClock is the guard for the mechanism Exit relies
// on (testing.Main and synctest.Test from a program): if a Go release breaks
// it, this fails.
func TestExitRunsOnTheVirtualClock(t *testing.T) {
	out, code := child(t, "sleep")
	if code != 7 || strings.TrimSpace(out) != "virtual 1h0m0s, wall under a minute true, in bubble true" {
		t.Fatalf("exit code %d, output:\n%s\nwant code 7 and an hour of virtual sleep in the bubble", code, out)
	}
}

// TestExitRelaysCancel: cancelling the outside context cancels the
// bubble's.
func TestExitRelaysCancel(t *testing.T) {
	out, code := child(t, "cancel")
	if code != 5 || strings.TrimSpace(out) != "cancelled: context canceled" {
		t.Fatalf("exit code %d, output:\n%s\nwant code 5 once the outside context is cancelled", code, out)
	}
}

func TestInBubble(t *testing.T) {
	if InBubble() {
		t.Error("InBubble outside a bubble")
	}
}

// Sleep waits its whole duration on the bubble's clock, and no longer than
// its context lasts.
func TestSleep(t *testing.T) {
	for _, tc := range []struct {
		name   string
		d      time.Duration
		cancel time.Duration // 0: never
		want   time.Duration
	}{
		{"whole", time.Minute, 0, time.Minute},
		{"cut short", time.Minute, 5 * time.Second, 5 * time.Second},
		{"nothing", 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tc.cancel > 0 {
					time.AfterFunc(tc.cancel, cancel)
				}
				start := time.Now()
				Sleep(ctx, tc.d)
				if got := time.Since(start); got != tc.want {
					t.Errorf("slept %v, want %v", got, tc.want)
				}
			})
		})
	}
}
