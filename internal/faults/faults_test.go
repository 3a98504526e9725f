package faults

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// target stands for node.Config, node.Node, gossip.Config and
// gossip.Gossip: it keeps what the hooks hand it, as they do.
type target struct {
	node      Node
	host      Host
	drop      func() bool
	published []byte
}

func (t *target) FaultSlots(Key) (*Node, *Host) { return &t.node, &t.host }

func (t *target) FaultProbe(Key) Probe {
	return Probe{
		Recent:    func() (w, c, r []float64) { return []float64{1}, []float64{2}, []float64{3} },
		Computing: func() bool { return t.node.Loss > 0 },
	}
}

func (t *target) FaultDrop(Key) *func() bool { return &t.drop }

func (t *target) FaultPublish(Key) PublishFunc {
	return func(_ context.Context, data []byte) error {
		if data == nil {
			return errors.New("nothing to publish")
		}
		t.published = data
		return nil
	}
}

// Each hook reaches the state its target hands it, and only that.
func TestHooksReachTheirTarget(t *testing.T) {
	for _, tc := range []struct {
		name  string
		apply func(*target) error
		check func(*target) bool
	}{
		{"SetNode", func(tg *target) error { SetNode(tg, Node{Loss: 0.5}); return nil },
			func(tg *target) bool { return tg.node.Loss == 0.5 && !tg.host.RefuseDirectInbound }},
		{"SetHost", func(tg *target) error { SetHost(tg, Host{RefuseDirectInbound: true}); return nil },
			func(tg *target) bool { return tg.host.RefuseDirectInbound && tg.node.Loss == 0 }},
		{"SetGossipDrop", func(tg *target) error { SetGossipDrop(tg, func() bool { return true }); return nil },
			func(tg *target) bool { return tg.drop != nil && tg.drop() }},
		{"PublishRaw", func(tg *target) error { return PublishRaw(tg, context.Background(), []byte("raw")) },
			func(tg *target) bool { return string(tg.published) == "raw" }},
		{"Recent", func(*target) error { return nil },
			func(tg *target) bool {
				w, c, r := Recent(tg)
				return slices.Equal(w, []float64{1}) && slices.Equal(c, []float64{2}) && slices.Equal(r, []float64{3})
			}},
		{"Computing", func(tg *target) error { SetNode(tg, Node{Loss: 0.1}); return nil },
			func(tg *target) bool { return Computing(tg) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tg := &target{}
			if err := tc.apply(tg); err != nil {
				t.Fatal(err)
			}
			if !tc.check(tg) {
				t.Errorf("after %s: %+v", tc.name, tg)
			}
		})
	}
	if err := PublishRaw(&target{}, context.Background(), nil); err == nil {
		t.Error("PublishRaw hid the publisher's error")
	}
}
