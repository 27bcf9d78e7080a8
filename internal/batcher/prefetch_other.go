//go:build !amd64

package batcher

// prefetch is prefetch_amd64.go's hint; elsewhere nothing.
func prefetch([]byte) {}
