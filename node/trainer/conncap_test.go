package trainer

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pspnode/pspnode/node/trainer/trainerpb"
)

// The trainer socket holds a bounded number of connections: of 2 000 idle
// ones (connected, never a byte) it keeps at most the cap and closes the
// others; a trainer that connects meanwhile has its session refused with
// RESOURCE_EXHAUSTED and a message that names the cap; once the idle ones
// close, a trainer connects. Before, the socket held all 2 000.
func TestTrainerSocketConnectionsCapped(t *testing.T) {
	d := startDaemon(t, "conncap", nil, "asp", nil)
	path := strings.TrimPrefix(d.addr, "unix:")
	const idle = 2000
	conns := make([]net.Conn, 0, idle)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range idle {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// A held connection hears nothing more than the server's preface
	// until the deadline; a refused one ends (after a GOAWAY, for those
	// the daemon had room to tell).
	var mu sync.Mutex
	held := 0
	var wg sync.WaitGroup
	deadline := time.Now().Add(refuseLinger + time.Second)
	for _, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(deadline)
			_, err := io.Copy(io.Discard, c)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				mu.Lock()
				held++
				mu.Unlock()
				return
			}
			_ = c.Close()
		})
	}
	wg.Wait()
	if max := DefaultConfig().MaxConns; held > max || held == 0 {
		t.Errorf("%d of %d idle connections held: want the cap, %d", held, idle, max)
	}
	if got := testutil.ToFloat64(d.srv.ln.(*cappedListener).refusedTotal); got < float64(idle-held) {
		t.Errorf("%v refusals counted, want at least %d", got, idle-held)
	}
	// A trainer meanwhile is told why.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	stream, err := pb.NewTrainerClient(dial(t, d.addr)).Session(ctx)
	if err == nil {
		_ = stream.Send(&pb.TrainerMessage{Msg: &pb.TrainerMessage_Hello{Hello: hello("m", 7, 4, 0)}})
		_, err = stream.Recv()
	}
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "too many connections") {
		t.Errorf("a trainer beside %d held connections: %v; want RESOURCE_EXHAUSTED naming the cap", held, err)
	}
	cancel()
	for _, c := range conns {
		_ = c.Close()
	}
	conns = nil
	deadline = time.Now().Add(10 * time.Second)
	for {
		tr, err := connect(t, d.addr, hello("m", 7, 4, 0), nil)
		if err == nil {
			tr.close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no trainer could connect once the idle connections closed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
