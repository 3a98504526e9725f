package node

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// handleModel sends the current model to a joining peer.
func (n *Node) handleModel(s network.Stream) {
	defer s.Close()
	ctx, cancel := context.WithTimeout(n.life, 10*n.cfg.QueryTimeout)
	defer cancel()
	defer guard(ctx, s)()
	_ = s.SetDeadline(time.Now().Add(10 * n.cfg.QueryTimeout))
	body, err := readFrame(smallReader(s, 8), 8)
	if err != nil || len(body) != 1 || body[0] != wireVersion {
		n.m.modelBad.Inc()
		_ = s.Reset()
		return
	}
	snap := ModelSnapshot{Step: n.step.Load(), ModelID: n.task.ModelID(), Params: n.task.Params()}
	if err := writeFrame(s, MarshalModel(snap)); err != nil {
		_ = s.Reset()
	}
}

// fetchModel asks one peer for its model.
func (n *Node) fetchModel(ctx context.Context, p peer.ID) (ModelSnapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*n.cfg.QueryTimeout)
	defer cancel()
	s, err := n.h.NewStream(ctx, p, n.modelID)
	if err != nil {
		return ModelSnapshot{}, err
	}
	defer guard(ctx, s)()
	deadline, _ := ctx.Deadline()
	_ = s.SetDeadline(deadline)
	if err := writeFrame(s, []byte{wireVersion}); err != nil {
		_ = s.Reset()
		return ModelSnapshot{}, err
	}
	_ = s.CloseWrite()
	limit := MaxModelFrame(n.task.NumParams())
	body, err := readFrame(bufio.NewReader(io.LimitReader(s, int64(limit)+binary.MaxVarintLen64)), limit)
	if err != nil {
		_ = s.Reset()
		return ModelSnapshot{}, err
	}
	_ = s.Close()
	return UnmarshalModel(body, n.task.ModelID(), n.task.NumParams())
}
