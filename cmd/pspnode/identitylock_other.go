//go:build !unix

package main

// lockIdentity does nothing where flock is not available.
func lockIdentity(string) (func(), error) { return func() {}, nil }
