package spool

import (
	"os"
	"syscall"
	"time"
	"unsafe"

	bolt "go.etcd.io/bbolt"
)

// Page-cache advice for bbolt's mapping, which it advises MADV_RANDOM:
//
//   - from a cold page cache every page of a chunk is its own read, which
//     capped a drain at ~90k events/s: Lane.read asks for the pages of the
//     chunks it is about to copy (MADV_WILLNEED);
//   - every page touched stays mapped, so the RSS grows with the file (a
//     drained 5 GB backlog left gigabytes of it): readers, the store after
//     each commit (and every few megabytes of deletions) and Open drop the
//     whole mapping (MADV_DONTNEED on a shared file mapping only unmaps:
//     the data stays in the page cache).
//
// Every call happens inside a bbolt transaction, while bbolt cannot remap
// the file. Advice is best effort.

// adviseAge: Lane.read asks for pages only for chunks this old (a backlog);
// for newer ones the calls were 22% of the relay's CPU at 100-event load.
const adviseAge = 10 * time.Second

// adviseGap is the largest hole between two chunks' pages that one advice
// call spans: fewer system calls, few pages advised for nothing.
const adviseGap = 256 << 10

var osPage = uintptr(os.Getpagesize())

// mapping returns db's mapping up to the high water mark of tx. Call it and
// use the result only inside tx.
func mapping(db *bolt.DB, tx *bolt.Tx) []byte {
	size := tx.Size()
	if size <= 0 {
		return nil
	}
	// Info().Data is the mapping's address; read it as a pointer (the
	// mapping is not Go memory and stays put while tx is open).
	info := db.Info()
	base := *(*unsafe.Pointer)(unsafe.Pointer(&info.Data))
	return unsafe.Slice((*byte)(base), int(size))
}

// spans collects page-aligned offsets into a mapping, merging neighbours
// closer than adviseGap.
type spans []struct{ lo, hi uintptr }

// add notes the pages of b if b lies in the mapping m (a value may be a
// copy on the heap, where MADV_DONTNEED would zero it).
func (ss *spans) add(m, b []byte) {
	if len(b) == 0 || len(m) == 0 {
		return
	}
	m0 := uintptr(unsafe.Pointer(unsafe.SliceData(m)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < m0 || p+uintptr(len(b)) > m0+uintptr(len(m)) {
		return
	}
	lo := (p - m0) &^ (osPage - 1) // m0 is page-aligned
	hi := min((p-m0+uintptr(len(b))+osPage-1)&^(osPage-1), uintptr(len(m)))
	if n := len(*ss); n > 0 {
		last := &(*ss)[n-1]
		if lo <= last.hi+adviseGap && hi+adviseGap >= last.lo {
			last.lo, last.hi = min(last.lo, lo), max(last.hi, hi)
			return
		}
	}
	*ss = append(*ss, struct{ lo, hi uintptr }{lo, hi})
}

// advise gives advice for every span of m.
func (ss spans) advise(m []byte, advice int) {
	for _, s := range ss {
		_ = syscall.Madvise(m[s.lo:s.hi], advice)
	}
}

// trimTx drops every page of db's mapping from the RSS, inside tx (a write
// transaction too: its nodes' pages fault back in from the page cache).
func trimTx(db *bolt.DB, tx *bolt.Tx) {
	if m := mapping(db, tx); len(m) > 0 {
		_ = syscall.Madvise(m, syscall.MADV_DONTNEED)
	}
}

// trimMapping is trimTx in a read transaction of its own.
func trimMapping(db *bolt.DB) {
	_ = db.View(func(tx *bolt.Tx) error {
		trimTx(db, tx)
		return nil
	})
}
