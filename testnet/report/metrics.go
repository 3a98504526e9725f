package report

import "github.com/prometheus/client_golang/prometheus"

// CounterOf is the value of the counter name{label=value} in reg (0 if
// absent).
func CounterOf(reg *prometheus.Registry, name, label, value string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" {
				return m.GetCounter().GetValue()
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
