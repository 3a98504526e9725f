package node

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// Close may be called more than once (a deferred Close after an explicit
// one): the second call returns at once with the first's result. It used to
// wait for the serve goroutine's result a second time and block forever.
func TestHTTPServerCloseTwice(t *testing.T) {
	s, err := serveHTTP("127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + s.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(body) != "ok" {
		t.Fatalf("served %q, %v; want \"ok\"", body, err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("second Close: %v", err)
		}
	case <-time.After(10 * time.Second): // only bounds a hang; a correct Close returns at once
		t.Fatal("the second Close did not return")
	}
	if _, err := http.Get("http://" + s.Addr().String() + "/"); err == nil {
		t.Error("the server still answers after Close")
	}
}
