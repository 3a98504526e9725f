// Package trainer is the trainer API of a pspnode daemon: a gRPC service
// on a local socket through which a training loop in another process, in
// any language, drives a node (pspnode run --trainer unix:PATH).
//
// The split of work: the daemon keeps the job's membership, the population
// estimate, the barrier decision and the exchange of updates with peers
// (node.Driver); the trainer owns the model and the compute. The contract
// is proto/pspnode/trainer/v3/trainer.proto (errors carry an ErrorInfo whose
// reason and metadata errors.go builds); clients/python holds a Python
// client and a torch.optim wrapper.
//
// One trainer at a time: its Session stream is its presence. Hello fixes
// the model of a daemon whose first trainer it is (RemoteModel), or is checked
// against it; the daemon waits for its job (reporting why, as /health
// does), takes the step and model to start from (its checkpoint, or a
// peer's model when the job is ahead), and answers Welcome. Then each step
// is Publish (or Step: Publish, Barrier and Pull in one call), and peers
// joining the job fetch the model through the session (ParamsRequest).
// When the stream ends the node stops counting in its peers' barriers and
// population (node.Driver.Deactivate) until the next trainer.
//
// Tensors are float32 little-endian vectors. A trainer on the same Linux
// machine maps a shared file instead of sending them through the socket:
// what it publishes the daemon copies once out of the file; what peers
// send is added into one of two regions of the file while the trainer
// reads the other, so a Pull copies nothing.
package trainer
