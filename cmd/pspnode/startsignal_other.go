//go:build !unix

package main

import "context"

// notifyStart: there is no SIGUSR1 here.
func notifyStart() (wait func(context.Context) error, stop func(), err error) {
	return nil, nil, usagef("--start-on-signal needs SIGUSR1 (Unix)")
}
