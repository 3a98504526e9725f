// Package vclock runs a function on a virtual clock from a program, not only
// from a test.
//
// The virtual clock is Go's testing/synctest bubble. Inside a bubble every
// timer, sleep, deadline and time.Now follows a fake clock that moves only
// when every goroutine in the bubble is durably blocked (waiting on a
// timer, a channel or a sync.Cond of the bubble). CPU work takes no virtual
// time: a bubble of a thousand libp2p nodes reports the same figures on a
// loaded two-core laptop as on an idle server, only the wall time differs.
//
// synctest.Test needs a *testing.T, which only the testing package can
// make. Exit gets one from testing.Main, the function the testing package
// keeps for programs that run tests without "go test" (exported since Go 1
// and covered by the Go 1 compatibility promise, unlike testing.MainStart).
// testing.Main ends the process when its tests end, so Exit never returns:
// the function it runs does the whole job and returns the exit code.
// TestExitRunsOnTheVirtualClock, in this package, fails loudly if a Go
// release changes any of this.
//
// Rules for code inside the bubble: create everything it uses inside it
// (contexts, channels, hosts); never wait on anything outside it (real
// sockets, a context made outside); and stop every goroutine it starts.
// Exit relays a cancellation of the outside context into the bubble.
package vclock
