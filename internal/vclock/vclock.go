package vclock

import (
	"context"
	"flag"
	"fmt"
	"os"
	"regexp"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Clock tells the bubble how much wall time has passed; the bubble's own
// time package only knows virtual time.
type Clock struct {
	start time.Time
	wall  atomic.Int64 // nanoseconds of wall time since start, kept fresh from outside the bubble
}

// Wall returns the wall time since Exit started the bubble, to within a few
// milliseconds.
func (c *Clock) Wall() time.Duration { return time.Duration(c.wall.Load()) }

// relayPeriod is how often, in virtual time, the bubble looks whether the
// outside context was cancelled, and how often (in wall time) the wall
// clock is refreshed.
const relayPeriod = 20 * time.Millisecond

// Exit runs f inside a synctest bubble and ends the process with f's return
// value as its exit code. It never returns. f's context is made inside the
// bubble and is cancelled soon after ctx is (within relayPeriod of virtual
// time once the bubble's clock moves).
//
// f should print its results itself. Exit ends the process from inside the
// bubble as soon as f returns, without waiting for goroutines f left
// behind; tests of the code f runs should use synctest.Test, which fails
// when a goroutine is left behind.
//
// If the bubble deadlocks (every goroutine blocked on something only the
// bubble could release) the testing package reports it with every
// goroutine's stack and the process exits with a non-zero code.
func Exit(ctx context.Context, f func(ctx context.Context, clock *Clock) int) {
	clock := &Clock{start: time.Now()}
	var stopped atomic.Bool
	go func() { // outside the bubble; runs until the process ends
		tick := time.NewTicker(relayPeriod)
		defer tick.Stop()
		done := ctx.Done()
		for {
			select {
			case <-done:
				stopped.Store(true)
				done = nil
			case <-tick.C:
				clock.wall.Store(int64(time.Since(clock.start)))
			}
		}
	}()
	testing.Init()
	if !flag.Parsed() {
		// testing.Main would parse os.Args (the program's own flags) as
		// test flags; give it none.
		_ = flag.CommandLine.Parse(nil)
	}
	match := func(pat, str string) (bool, error) { return regexp.MatchString(pat, str) }
	testing.Main(match, []testing.InternalTest{{
		Name: "virtual-clock",
		F: func(t *testing.T) {
			synctest.Test(t, func(*testing.T) {
				inner, cancel := context.WithCancel(context.Background())
				go relay(inner, cancel, &stopped)
				code := f(inner, clock)
				cancel()
				os.Exit(code)
			})
			// Not reached: f's bubble ends the process. If a Go release
			// ever gets here, say so rather than exit 0 silently.
			fmt.Fprintln(os.Stderr, "vclock: the bubble returned without ending the process")
			os.Exit(3)
		},
	}}, nil, nil)
	fmt.Fprintln(os.Stderr, "vclock: testing.Main returned")
	os.Exit(3)
}

// relay cancels the bubble's context once the outside one is (stopped is
// set from outside). It polls on the virtual clock: a bubble may not wait on
// a channel made outside it.
func relay(ctx context.Context, cancel context.CancelFunc, stopped *atomic.Bool) {
	tick := time.NewTicker(relayPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if stopped.Load() {
				cancel()
				return
			}
		}
	}
}

// InBubble reports whether the calling goroutine runs on a virtual clock
// (inside a synctest bubble). It must not be called while another goroutine
// of the same bubble calls it or synctest.Wait.
func InBubble() (in bool) {
	defer func() {
		if recover() != nil {
			in = false
		}
	}()
	synctest.Wait() // panics outside a bubble
	return true
}

// Sleep waits for d on the caller's clock (virtual inside a bubble) or
// until ctx ends, whichever comes first.
func Sleep(ctx context.Context, d time.Duration) {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
	case <-tm.C:
	}
}
