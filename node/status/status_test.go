package status

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/protocol"
)

// Close may be called more than once (a deferred Close after an explicit
// one): the second call returns at once with the first's result. It used to
// wait for the serve goroutine's result a second time and block forever.
func TestServerCloseTwice(t *testing.T) {
	s, err := Serve("127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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

func TestTrafficClassOf(t *testing.T) {
	m := NewMeter("job")
	for p, want := range map[protocol.ID]string{
		"/psp/job/kad/1.0.0":      "dht",
		"/psp/job/step/1.0.0":     "step",
		"/psp/job/model/2.0.0":    "model",
		"/psp/job/pool/1.0.0":     "pool",
		"/psp/job/exchange/2.0.0": "exchange",
		"/meshsub/1.3.0":          "gossip",
		"/floodsub/1.0.0":         "gossip",
		"/psp/other/step/1.0.0":   "other",
		"/psp/job/what/1.0.0":     "other",
		"/ipfs/id/1.0.0":          "other",
		"":                        "other",
	} {
		if got := Classes[m.classOf(p)]; got != want {
			t.Errorf("class of %q = %s, want %s", p, got, want)
		}
	}
}
