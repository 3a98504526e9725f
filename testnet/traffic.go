package testnet

import (
	"time"

	"github.com/pspnode/pspnode/node/status"
)

// TrafficReport is what the honest live nodes' streams carried during
// training (status.Traffic, from each node's launch to the end), per node:
// bytes per second of training, bytes received per step taken, and the
// same by protocol class (status.Classes).
type TrafficReport struct {
	InBytesPerNodeS  float64 `json:"in_bytes_per_node_s"`
	OutBytesPerNodeS float64 `json:"out_bytes_per_node_s"`
	InBytesPerStep   float64 `json:"in_bytes_per_step"`
	// ByProtocol holds each class's bytes per node per second.
	ByProtocol map[string]ClassTraffic `json:"by_protocol"`
	// GossipAmplification is the GossipSub bytes the nodes received per
	// byte of update payload GossipSub delivered to them (absent without
	// gossip).
	GossipAmplification float64 `json:"gossip_amplification,omitempty"`
}

// ClassTraffic is one protocol class's bytes per node per second.
type ClassTraffic struct {
	InBytesPerNodeS  float64 `json:"in_bytes_per_node_s"`
	OutBytesPerNodeS float64 `json:"out_bytes_per_node_s"`
}

// trafficSum adds up the training traffic of nodes.
type trafficSum struct {
	t      status.Traffic
	nodeS  float64
	steps  int64
	filled bool
}

// add counts one live node: its traffic since launch, over up of training,
// in which it took steps steps.
func (s *trafficSum) add(m *member, up time.Duration) {
	d := m.nd.Traffic().Sub(m.traffic0)
	if !s.filled {
		s.t.ByProtocol = map[string]status.ProtocolTraffic{}
		s.filled = true
	}
	s.t.InBytes += d.InBytes
	s.t.OutBytes += d.OutBytes
	s.t.GossipPayloadBytes += d.GossipPayloadBytes
	for k, v := range d.ByProtocol {
		c := s.t.ByProtocol[k]
		c.InBytes += v.InBytes
		c.OutBytes += v.OutBytes
		s.t.ByProtocol[k] = c
	}
	s.nodeS += up.Seconds()
	s.steps += m.nd.Step() - m.step0
}

func (s *trafficSum) report() *TrafficReport {
	if !s.filled || s.nodeS <= 0 {
		return nil
	}
	r := &TrafficReport{
		InBytesPerNodeS:  float64(s.t.InBytes) / s.nodeS,
		OutBytesPerNodeS: float64(s.t.OutBytes) / s.nodeS,
		ByProtocol:       map[string]ClassTraffic{},
	}
	if s.steps > 0 {
		r.InBytesPerStep = float64(s.t.InBytes) / float64(s.steps)
	}
	for k, v := range s.t.ByProtocol {
		r.ByProtocol[k] = ClassTraffic{float64(v.InBytes) / s.nodeS, float64(v.OutBytes) / s.nodeS}
	}
	if s.t.GossipPayloadBytes > 0 {
		r.GossipAmplification = float64(s.t.ByProtocol["gossip"].InBytes) / float64(s.t.GossipPayloadBytes)
	}
	return r
}

// meanInBytes is the mean over the live members of the bytes each received
// since its launch.
func meanInBytes(live []*member) float64 {
	if len(live) == 0 {
		return 0
	}
	var sum float64
	for _, m := range live {
		sum += float64(m.nd.Traffic().InBytes - m.traffic0.InBytes)
	}
	return sum / float64(len(live))
}
