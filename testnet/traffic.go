package testnet

import (
	"time"

	"github.com/pspnode/pspnode/node/status"
	"github.com/pspnode/pspnode/testnet/report"
)

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

func (s *trafficSum) report() *report.TrafficReport {
	if !s.filled || s.nodeS <= 0 {
		return nil
	}
	r := &report.TrafficReport{
		InBytesPerNodeS:  float64(s.t.InBytes) / s.nodeS,
		OutBytesPerNodeS: float64(s.t.OutBytes) / s.nodeS,
		ByProtocol:       map[string]report.ClassTraffic{},
	}
	if s.steps > 0 {
		r.InBytesPerStep = float64(s.t.InBytes) / float64(s.steps)
	}
	for k, v := range s.t.ByProtocol {
		r.ByProtocol[k] = report.ClassTraffic{InBytesPerNodeS: float64(v.InBytes) / s.nodeS, OutBytesPerNodeS: float64(v.OutBytes) / s.nodeS}
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
