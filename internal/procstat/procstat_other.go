//go:build !unix

package procstat

import "time"

// CPUTime is not measured on this platform.
func CPUTime() time.Duration { return 0 }

// PeakRSS is not measured on this platform.
func PeakRSS() int64 { return 0 }

// ResetPeakRSS does nothing on this platform.
func ResetPeakRSS() bool { return false }

// RSS is not measured on this platform.
func RSS() int64 { return 0 }

// StartTime is not known on this platform: the zero time.
func StartTime() time.Time { return time.Time{} }
