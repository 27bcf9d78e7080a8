package spool

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"
)

// pageFile reads a bbolt file page by page, trusting no page: every offset
// and length is checked, so a damaged or truncated file yields errors, not
// panics or faults. Verify and checkDBFile walk the tree with it from the
// meta page bbolt would use, skipping the pages they cannot read.
type pageFile struct {
	f      *os.File
	size   int64
	ps     int64
	meta   boltMeta
	mapped []byte // the used pages, when checkDBFile mapped them; else ReadAt
}

// bbolt page flags and leaf element flags.
const (
	boltBranch      = 0x01
	boltLeaf        = 0x02
	boltBucketValue = 0x01 // leaf element: the value is a bucket
	boltElemLen     = 16
)

// openPageFile opens the bbolt file at path for reading pages.
func openPageFile(path string) (*pageFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	pf := &pageFile{f: f, size: fi.Size()}
	var best *boltMeta
	for _, off := range []int64{0, 1024, 2048, 4096, 8192, 16384, 32768, 65536} {
		b := make([]byte, boltPageHeader+boltMetaLen)
		if n, _ := f.ReadAt(b, off); n < len(b) {
			continue
		}
		if m, err := parseBoltMeta(b); err == nil && (off == 0 || int64(m.pageSize) == off) && (best == nil || m.txid > best.txid) {
			best = &m
		}
	}
	if best == nil {
		f.Close()
		return nil, fmt.Errorf("%w: no valid meta page", ErrDamaged)
	}
	pf.meta, pf.ps = *best, int64(best.pageSize)
	return pf, nil
}

// page reads page id with its overflow pages.
func (pf *pageFile) page(id uint64) ([]byte, error) {
	if id < 2 || id >= pf.meta.hwm {
		return nil, fmt.Errorf("page %d: out of range", id)
	}
	off := int64(id) * pf.ps
	p, err := pf.read(off, pf.ps)
	if err != nil {
		return nil, fmt.Errorf("page %d: %w", id, err)
	}
	if got := binary.LittleEndian.Uint64(p); got != id {
		return nil, fmt.Errorf("page %d: header names page %d", id, got)
	}
	if over := uint64(binary.LittleEndian.Uint32(p[12:])); over > 0 {
		if id+over >= pf.meta.hwm {
			return nil, fmt.Errorf("page %d: its %d overflow pages run past the used pages", id, over)
		}
		if p, err = pf.read(off, int64(over+1)*pf.ps); err != nil {
			return nil, fmt.Errorf("page %d: %w", id, err)
		}
	}
	return p, nil
}

// read returns the n bytes at off: from the mapping, when checkDBFile
// mapped the used pages, else read into a buffer of their own.
func (pf *pageFile) read(off, n int64) ([]byte, error) {
	if off+n > pf.size || pf.mapped != nil && off+n > int64(len(pf.mapped)) {
		return nil, errors.New("past the end of the file")
	}
	if pf.mapped != nil {
		return pf.mapped[off : off+n : off+n], nil
	}
	b := make([]byte, n)
	_, err := pf.f.ReadAt(b, off)
	return b, err
}

// walkFunc sees a bucket's key and value; bucket is set when v is a nested
// bucket's header (with its inline page).
type walkFunc func(k, v []byte, bucket bool)

// walkBucket visits every element of the bucket whose header is bh (root
// page, sequence, an inline bucket's page), in key order; pages it cannot
// read are reported to bad and skipped.
func (pf *pageFile) walkBucket(bh []byte, visit walkFunc, bad func(error)) {
	if len(bh) < 16 {
		bad(errors.New("bucket header too short"))
		return
	}
	var inline []byte // the page of a bucket without a root page of its own
	root := binary.LittleEndian.Uint64(bh)
	if root == 0 {
		inline = bh[16:]
	}
	pf.walkPage(inline, root, visit, bad, 0)
}

// maxDepth bounds the tree walk (a damaged branch page may point up).
const maxDepth = 64

// walkPage visits the elements of page p, or of page id when p is nil (id
// names the page in messages; 0 for an inline one).
func (pf *pageFile) walkPage(p []byte, id uint64, visit walkFunc, bad func(error), depth int) {
	var err error
	if depth > maxDepth {
		err = fmt.Errorf("page %d: tree deeper than %d", id, maxDepth)
	} else if p == nil {
		p, err = pf.page(id)
	}
	if err != nil {
		bad(err)
		return
	}
	if len(p) < boltPageHeader {
		bad(fmt.Errorf("page %d: short", id))
		return
	}
	flags := binary.LittleEndian.Uint16(p[8:])
	count := int(binary.LittleEndian.Uint16(p[10:]))
	if boltPageHeader+count*boltElemLen > len(p) {
		bad(fmt.Errorf("page %d: %d elements do not fit", id, count))
		return
	}
	for i := range count {
		e := boltPageHeader + i*boltElemLen
		el := p[e : e+boltElemLen]
		switch flags {
		case boltBranch:
			pf.walkPage(nil, binary.LittleEndian.Uint64(el[8:]), visit, bad, depth+1)
		case boltLeaf:
			fl := binary.LittleEndian.Uint32(el)
			pos := int64(binary.LittleEndian.Uint32(el[4:]))
			ks := int64(binary.LittleEndian.Uint32(el[8:]))
			vs := int64(binary.LittleEndian.Uint32(el[12:]))
			start := int64(e) + pos
			if start+ks+vs > int64(len(p)) || start < 0 {
				bad(fmt.Errorf("page %d: element %d runs past the page", id, i))
				continue
			}
			visit(p[start:start+ks], p[start+ks:start+ks+vs], fl&boltBucketValue != 0)
		default:
			bad(fmt.Errorf("page %d: neither a branch nor a leaf (flags %#x)", id, flags))
			return
		}
	}
}

// rootHeader is the root bucket's header (from the meta page).
func (pf *pageFile) rootHeader() []byte {
	return binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, pf.meta.root), 0)
}

// checkDBFile checks the bbolt file at path before bbolt maps it: the meta
// page bbolt would use must count no more pages than the file holds. When
// the file has no freelist on disk, bbolt rebuilds it by walking the tree
// in a goroutine of its own, where a damaged page is a panic no caller can
// recover: so the same walk runs here first, over the used pages mapped
// read-only (as cheap as bbolt's), and its first problem is ErrDamaged.
func checkDBFile(path string) (err error) {
	pf, err := openPageFile(path)
	if err != nil {
		return err
	}
	defer pf.f.Close()
	n := int64(pf.meta.hwm) * pf.ps
	if n > pf.size {
		return fmt.Errorf("%w: the file holds %d bytes but its pages take %d (truncated)", ErrDamaged, pf.size, n)
	}
	if pf.meta.freelist != ^uint64(0) {
		return nil // bbolt reads the freelist; it walks nothing
	}
	m, err := syscall.Mmap(int(pf.f.Fd()), 0, int(n), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("map %s: %w", path, err)
	}
	defer syscall.Munmap(m)
	pf.mapped = m
	var first error
	bad := func(err error) {
		first = cmp.Or(first, err)
	}
	var walk func(bh []byte, depth int)
	walk = func(bh []byte, depth int) {
		if depth > maxDepth {
			bad(errors.New("buckets nested too deep"))
			return
		}
		pf.walkBucket(bh, func(_, v []byte, bucket bool) {
			if bucket && first == nil {
				walk(v, depth+1)
			}
		}, bad)
	}
	err = guard(func() error {
		walk(pf.rootHeader(), 0)
		return nil
	})
	if err != nil {
		return err
	}
	if first != nil {
		return fmt.Errorf("%w: %w", ErrDamaged, first)
	}
	return nil
}
