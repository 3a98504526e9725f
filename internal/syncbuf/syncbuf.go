// Package syncbuf is a buffer that many goroutines may write while a test
// reads it: what a logger or a child process writes, collected.
package syncbuf

import (
	"strings"
	"sync"
)

// Buffer collects what is written to it. The zero value is empty and
// ready; it is safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p; it never fails.
func (o *Buffer) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

// String is everything written so far.
func (o *Buffer) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}
