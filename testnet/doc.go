// Package testnet runs many pspnode nodes on one machine, with straggler and
// churn schedules, records what happens and draws the figures. Its
// subpackage sim is a discrete-event simulator that drives the same psp code.
package testnet
