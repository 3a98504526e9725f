package wire

import "testing"

// Every protocol of a job is /psp/<job>/<name>/<version>, and the DHT's
// prefix is what kad-dht puts before its kad/1.0.0.
func TestProtocolIDs(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{string(StepProtocol("j")), "/psp/j/step/1.0.0"},
		{string(StepProtocolExt("j")), "/psp/j/step/1.1.0"},
		{string(ModelProtocol("j")), "/psp/j/model/2.0.0"},
		{string(ExchangeProtocol("j")), "/psp/j/exchange/2.0.0"},
		{string(PoolProtocol("j")), "/psp/j/pool/1.0.0"},
		{string(TrainerStateProtocol("j")), "/psp/j/trainer-state/2.0.0"},
		{string(DHTProtocol("j")), string(DHTPrefix("j")) + "/kad/1.0.0"},
		{JobPrefix("j"), "/psp/j/"},
	} {
		if tc.got != tc.want {
			t.Errorf("%q, want %q", tc.got, tc.want)
		}
	}
}
