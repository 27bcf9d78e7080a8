package spool

import (
	"os"
	"syscall"
	"time"
	"unsafe"

	bolt "go.etcd.io/bbolt"
)

// Page-cache advice for the bbolt mapping.
//
// bbolt reads through a shared, read-only mmap of the file that it advises
// MADV_RANDOM. Two consequences for a queue that is read once, front to back:
//
//   - From a cold page cache every 4 KiB page of a chunk is its own read
//     (no read-ahead), which caps a drain at ~90k events/s here. Lane.read
//     therefore asks for the pages of the chunks it is about to copy
//     (MADV_WILLNEED: one large read).
//   - Every page a reader or the store touched stays mapped, so the
//     process's RSS grows with the spool file (a drained 5 GB backlog left
//     gigabytes of file-backed RSS). The pages are page cache, not memory the
//     relay owns, but RSS is what operators and limits see. Every reader
//     drops the whole mapping after it copied (MADV_DONTNEED on a shared
//     file mapping only unmaps the pages: the data stays in the page cache
//     and on disk, and a reader that needs a page again faults it back in),
//     so does the store after each commit and every few megabytes of a
//     checkpoint's deletions, and so does Open.
//
// Every call happens inside a bbolt transaction: bbolt never remaps the file
// while one is open, so the addresses stay those of the mapping. Advice is
// best effort; errors are ignored.

// adviseAge: Lane.read asks for the pages ahead (MADV_WILLNEED) only for
// chunks at least this old (a backlog being caught up). Newer ones are in
// the page cache; the advice calls for them (several per read, each walking
// the pages) were 22% of the relay's CPU at 100-event load when every
// chunk was read from bbolt (before the WAL).
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

// add notes the pages of b, if b lies in the mapping m: a value can also be
// a copy on the Go heap (bbolt copies unaligned inline buckets), and advice
// there would be wrong (MADV_DONTNEED zeroes anonymous memory).
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

// trimTx drops every page of db's mapping from the process's RSS, inside
// tx (a write transaction too: the pages that tx's nodes still point into
// are read again from the page cache when it needs them).
func trimTx(db *bolt.DB, tx *bolt.Tx) {
	if m := mapping(db, tx); len(m) > 0 {
		_ = syscall.Madvise(m, syscall.MADV_DONTNEED)
	}
}

// trimMapping drops every page of db's mapping from the process's RSS. It
// must not run inside a write transaction of the caller's goroutine.
func trimMapping(db *bolt.DB) {
	_ = db.View(func(tx *bolt.Tx) error {
		trimTx(db, tx)
		return nil
	})
}
