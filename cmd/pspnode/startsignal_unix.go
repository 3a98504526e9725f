//go:build unix

package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// notifyStart sets up what --start-on-signal waits for. It must be called
// before the node prints its addresses: until then SIGUSR1 would end the
// process.
func notifyStart() (wait func(context.Context) error, stop func(), err error) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	wait = func(ctx context.Context) error {
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return wait, func() { signal.Stop(ch) }, nil
}
