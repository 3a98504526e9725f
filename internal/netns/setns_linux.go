package netns

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do runs f on an OS thread that has entered host h's network namespace:
// the sockets f opens belong to that namespace and stay in it, whichever
// thread uses them later. The thread goes back to its own namespace
// before the scheduler may use it again. It must not end instead: a
// child started with Pdeathsig (a testnet's nodes, a harness's workers) is
// killed when the thread that forked it ends, and any thread may have.
func (h *Host) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() { // ends when f does
		runtime.LockOSThread()
		own, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: %w", err)
			return
		}
		defer own.Close()
		ns, err := os.Open("/run/netns/" + h.NS)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: %w", err)
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: setns %s: %w", h.NS, err)
			return
		}
		err = f()
		if unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked, and ends with this goroutine
		errc <- err
	}()
	return <-errc
}

// DialContext connects from inside host h's namespace (an http.Transport's
// DialContext, say, for the node's 127.0.0.1 HTTP server).
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := h.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens inside host h's namespace.
func (h *Host) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := h.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}
