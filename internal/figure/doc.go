// Package figure draws pspnode's figures (PNG, with gonum.org/v1/plot, no
// cgo) and writes CSV files. It is shared by the simulator, the testnet and
// the bound commands so every figure looks alike.
package figure
