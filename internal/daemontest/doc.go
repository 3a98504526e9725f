// Package daemontest starts `pspnode run` daemons for tests that drive
// the real binary (the end-to-end and interop tests): it starts one,
// reads the peer ID, first dialable multiaddr and HTTP address it prints
// on stdout, and kills it when the test ends.
package daemontest
