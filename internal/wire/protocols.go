package wire

import (
	"strings"

	"github.com/libp2p/go-libp2p/core/protocol"
)

// The protocol IDs of a job, all spelled here: every pspnode protocol is
// /psp/<job>/<name>/<version> (docs/protocols.md, section 3), so that
// nodes of two jobs on one network never speak to each other's streams.

// JobPrefix is the prefix of every protocol of job: "/psp/<job>/".
func JobPrefix(job string) string { return "/psp/" + job + "/" }

// Protocol is job's protocol name at version.
func Protocol(job, name, version string) protocol.ID {
	return protocol.ID(JobPrefix(job) + name + "/" + version)
}

// DHTPrefix is the prefix kad-dht puts before its own protocol names
// (dht.ProtocolPrefix): "/psp/<job>".
func DHTPrefix(job string) protocol.ID { return protocol.ID(strings.TrimSuffix(JobPrefix(job), "/")) }

// StepProtocol is the step protocol's first version (step/1.0.0).
func StepProtocol(job string) protocol.ID { return Protocol(job, "step", "1.0.0") }

// StepProtocolExt is the step protocol with lineage and model fields
// (step/1.1.0).
func StepProtocolExt(job string) protocol.ID { return Protocol(job, "step", "1.1.0") }

// ModelProtocol is the model protocol (model/2.0.0).
func ModelProtocol(job string) protocol.ID { return Protocol(job, "model", "2.0.0") }

// ExchangeProtocol is the epidemic exchange's protocol (exchange/2.0.0).
func ExchangeProtocol(job string) protocol.ID { return Protocol(job, "exchange", "2.0.0") }

// DHTProtocol is the job's Kademlia DHT protocol (kad/1.0.0: go-libp2p-kad-dht
// with the prefix DHTPrefix).
func DHTProtocol(job string) protocol.ID { return Protocol(job, "kad", "1.0.0") }

// PoolProtocol is the overlay's pool announcements (pool/1.0.0).
func PoolProtocol(job string) protocol.ID { return Protocol(job, "pool", "1.0.0") }

// TrainerStateProtocol is the trainer-state protocol (trainer-state/2.0.0).
func TrainerStateProtocol(job string) protocol.ID { return Protocol(job, "trainer-state", "2.0.0") }
