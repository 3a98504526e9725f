// Package checkpoint is the node's checkpoint file (Config.Checkpoint of
// package node).
//
// A checkpoint holds a node's step and model so that a node restarted with
// the same identity resumes where it was. The file is
//
//	magic "PSPCKPT1" | job length u16 | job | step i64 | model id u32 |
//	n u32 | n × f64 params | CRC-32C of everything before it
//
// big-endian. It is written atomically: a temporary file in the same
// directory, fsync, rename over the old one, fsync of the directory. A
// reader checks every field and the checksum, so a truncated or corrupt
// file is an error (ErrCorrupt), never a silently wrong model.
//
// Where things are:
//
//	checkpoint.go  the file: Write, Read, Parse
package checkpoint
