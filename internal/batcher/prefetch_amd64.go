package batcher

// prefetch asks the CPU to bring b's cache lines into its cache without
// waiting for them (PREFETCHT0: a hint that neither faults nor blocks).
//
//go:noescape
func prefetch(b []byte)
