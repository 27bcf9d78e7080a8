package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
)

// Damage to spool.db must never crash the relay. bbolt maps the file and
// reads its pages in place: a page header it cannot parse makes it panic
// (slice bounds), and a mapping longer than the file makes the first touch
// past the file's end a SIGBUS. So:
//
//   - checkFiles, before the file is mapped, checks that a meta page is
//     valid and that the file holds every page that meta page counts (a
//     truncated file is refused, never mapped);
//   - guard runs bbolt calls with panics recovered and memory faults turned
//     into panics (debug.SetPanicOnFault), both reported as ErrDamaged;
//   - a chunk that fails its checksum is moved to dead letters (read.go).

// guard calls f and turns a panic (bbolt's, or a fault reading the
// mapping) into an error wrapping ErrDamaged.
func guard(f func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: %v", ErrDamaged, v)
		}
	}()
	return f()
}

// checkFiles refuses what Open must not go on with: spool.db missing or
// empty while the WAL holds records (errMismatch), and a spool.db whose
// meta pages are invalid or which is shorter than its pages (ErrDamaged).
func (s *Spool) checkFiles() error {
	fi, err := os.Stat(s.path)
	switch {
	case errors.Is(err, fs.ErrNotExist) || err == nil && fi.Size() == 0:
		if n, chunks, seg := walRecords(s.walDir); n > 0 {
			what := "missing"
			if err == nil {
				what = "empty"
			}
			return fmt.Errorf("%w: spool.db is %s but the write-ahead log holds records (%d chunks, segment %s and on)",
				errMismatch, what, chunks, segName(seg))
		}
		return nil
	case err != nil:
		return err
	}
	if err := checkDBFile(s.path, fi.Size()); err != nil {
		return err
	}
	return checkTree(s.path)
}

// walRecords counts the valid records of the WAL's segments in dir, and
// of them the chunks (the first segment holding one is seg).
func walRecords(dir string) (n, chunks int, seg uint64) {
	segs, _, err := walFiles(dir)
	if err != nil {
		return 0, 0, 0
	}
	for _, no := range segs {
		data, err := os.ReadFile(filepath.Join(dir, segName(no)))
		if err != nil {
			continue
		}
		sc := scanSegment(data, no, 0)
		for _, it := range sc.items {
			if it.damage == nil && it.rec.typ != recStart {
				if n == 0 {
					seg = no
				}
				n++
				if it.rec.typ == recChunk {
					chunks++
				}
			}
		}
	}
	return n, chunks, seg
}

// bbolt's file layout, as far as checkDBFile reads it (little-endian, as
// bbolt writes it on the machines the relay runs on): a page starts with a
// 16-byte header (id, flags, count, overflow); pages 0 and 1 are meta
// pages, whose body is magic, version, page size, flags, root bucket (root
// page, sequence), freelist page, page count (high water mark), txid, and
// an FNV-64a checksum of the fields before it.
const (
	boltPageHeader = 16
	boltMetaLen    = 64
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
)

type boltMeta struct {
	pageSize            uint32
	root, freelist, hwm uint64
	txid                uint64
}

// parseBoltMeta decodes and checks the meta page at the start of p.
func parseBoltMeta(p []byte) (boltMeta, error) {
	if len(p) < boltPageHeader+boltMetaLen {
		return boltMeta{}, errors.New("short meta page")
	}
	m := p[boltPageHeader : boltPageHeader+boltMetaLen]
	le := binary.LittleEndian
	if le.Uint32(m) != boltMagic {
		return boltMeta{}, errors.New("meta page: bad magic")
	}
	if le.Uint32(m[4:]) != boltVersion {
		return boltMeta{}, fmt.Errorf("meta page: bbolt version %d", le.Uint32(m[4:]))
	}
	h := fnv.New64a()
	h.Write(m[:56])
	if h.Sum64() != le.Uint64(m[56:]) {
		return boltMeta{}, errors.New("meta page: checksum mismatch")
	}
	bm := boltMeta{
		pageSize: le.Uint32(m[8:]),
		root:     le.Uint64(m[16:]),
		freelist: le.Uint64(m[32:]),
		hwm:      le.Uint64(m[40:]),
		txid:     le.Uint64(m[48:]),
	}
	if ps := bm.pageSize; ps < 512 || ps > 1<<16 || ps&(ps-1) != 0 {
		return boltMeta{}, fmt.Errorf("meta page: page size %d", ps)
	}
	if bm.root >= bm.hwm || bm.freelist != ^uint64(0) && bm.freelist >= bm.hwm || bm.hwm < 3 {
		return boltMeta{}, errors.New("meta page: page ids past the page count")
	}
	return bm, nil
}

// checkDBFile checks the bbolt file at path of the given size before it is
// mapped: the meta page bbolt would use (the valid one with the higher
// txid) must count no more pages than the file holds.
func checkDBFile(path string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	read := func(off int64, n int) []byte {
		b := make([]byte, n)
		if off >= size {
			return nil
		}
		k, err := f.ReadAt(b, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil
		}
		return b[:k]
	}
	m0, err0 := parseBoltMeta(read(0, boltPageHeader+boltMetaLen))
	var metas []boltMeta
	var errs []error
	if err0 == nil {
		metas = append(metas, m0)
	} else {
		errs = append(errs, fmt.Errorf("page 0: %w", err0))
	}
	// Meta page 1 sits one page in: at meta 0's page size, or at the
	// usual sizes when meta 0 is unreadable.
	sizes := []int64{4096, 8192, 16384, 65536, 1024, 2048, 32768}
	if err0 == nil {
		sizes = []int64{int64(m0.pageSize)}
	}
	for _, ps := range sizes {
		m1, err1 := parseBoltMeta(read(ps, boltPageHeader+boltMetaLen))
		if err1 == nil && int64(m1.pageSize) == ps {
			metas = append(metas, m1)
			break
		}
		if len(sizes) == 1 {
			errs = append(errs, fmt.Errorf("page 1: %w", err1))
		}
	}
	if len(metas) == 0 {
		return fmt.Errorf("%w: no valid meta page (%w)", ErrDamaged, errors.Join(errs...))
	}
	use := metas[0]
	if len(metas) == 2 && metas[1].txid > use.txid {
		use = metas[1]
	}
	if need := int64(use.hwm) * int64(use.pageSize); need > size {
		return fmt.Errorf("%w: the file holds %d bytes but its pages take %d (truncated)", ErrDamaged, size, need)
	}
	return nil
}
