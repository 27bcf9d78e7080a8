package storage

import (
	"context"
	"sync/atomic"
	"testing"
)

// TestLeased: a context without a lease is always leased; one with a
// lease says what the lease says now, through derived contexts too.
func TestLeased(t *testing.T) {
	if !Leased(context.Background()) {
		t.Fatal("no lease: want leased")
	}
	var held atomic.Bool
	held.Store(true)
	ctx, cancel := context.WithCancel(WithLease(context.Background(), held.Load))
	defer cancel()
	if !Leased(ctx) {
		t.Fatal("held lease: want leased")
	}
	held.Store(false)
	if Leased(ctx) {
		t.Fatal("lease run out, context not cancelled: want not leased")
	}
}
