// Package checkpoint is the node's checkpoint file (Config.Checkpoint of
// package node).
//
// A checkpoint holds a node's step and model so that a node restarted with
// the same identity resumes where it was. The file is
//
//	magic "PSPCKPT1" | job length u16 | job | step i64 | model id u32 |
//	n u32 | n × f64 params | CRC-32C of everything before it
//
// big-endian. A trainer's model (pspnode run --trainer) is written as
// float32 instead (float32.go: magic "PSPCKPT2", n × f32 little-endian),
// from where it lies and read into where it goes a block at a time, so a
// model of hundreds of megabytes needs no copy of itself; every reader
// takes both. It is written atomically: a temporary file in the same
// directory, fsync, rename over the old one, fsync of the directory. A
// reader checks every field and the checksum, so a truncated or corrupt
// file is an error (ErrCorrupt), never a silently wrong model.
//
// Where things are:
//
//	checkpoint.go  the float64 file: Write, Read, Parse (which reads both)
//	float32.go     the float32 file: Write32, ReadInto (which reads both)
package checkpoint
