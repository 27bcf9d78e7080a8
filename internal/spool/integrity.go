package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"runtime/debug"
)

// Damage to spool.db must never crash the relay: bbolt panics on a page
// header it cannot parse, and a touch past the end of a truncated file is a
// SIGBUS. So checkFiles checks the file before it is mapped, and guard
// turns panics and faults of bbolt calls into ErrDamaged.

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

// checkFiles refuses spool.db missing or empty while the WAL holds records
// (errMismatch), and one that checkDBFile refuses.
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
	return checkDBFile(s.path)
}

// walRecords counts the log's records but recStart, its chunks, and the
// first segment holding one.
func walRecords(dir string) (n, chunks int, seg uint64) {
	lr, err := readLog(dir, nil, walPos{}, walPos{})
	if err != nil {
		return 0, 0, 0
	}
	for _, sg := range lr.segs {
		for _, r := range sg.recs {
			if r.typ == recStart {
				continue
			}
			if n == 0 {
				seg = sg.no
			}
			n++
			if r.typ == recChunk {
				chunks++
			}
		}
	}
	return n, chunks, seg
}

// bbolt's file layout (little-endian on the machines the relay runs on): a
// page starts with a 16-byte header (id, flags, count, overflow); pages 0
// and 1 are meta pages: magic, version, page size, flags, root bucket
// (root page, sequence), freelist page, page count (high water mark),
// txid, FNV-64a of the fields before it.
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
