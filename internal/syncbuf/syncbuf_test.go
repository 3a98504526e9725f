package syncbuf

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// Writers in parallel lose nothing, and a reader meanwhile sees whole
// writes (run under -race).
func TestBufferConcurrent(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				fmt.Fprintf(&b, "%d.%d\n", i, j)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := strings.Count(b.String(), "\n"); got != 800 {
		t.Errorf("%d lines, want 800", got)
	}
}
