package backfill

import (
	"archive/zip"
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// maxLine bounds one input line: an envelope line may hold many events, but
// a line longer than this is refused (the file is damaged or not JSON lines).
const maxLine = 64 << 20

// pos is a place in an input file: the zip entry (0 for a file that is not
// a zip) and the byte offset in that entry's (or file's) decompressed text.
type pos struct {
	Entry  int   `json:"entry"`
	Offset int64 `json:"offset"`
}

// line is one line of an input, with where it starts and where the next one
// starts.
type line struct {
	at   pos
	next pos
	text []byte // valid until the next read
}

// input reads the lines of one file from a position: JSON lines (plain or
// gzipped), or a zip archive (what `relay export` writes, or the
// upstream's export archive) whose entries are JSON lines, plain or
// gzipped.
type input struct {
	f     *os.File
	zr    *zip.Reader
	files []*zip.File // the zip's entries, in archive order
	entry int
	rc    io.Closer // the open zip entry (a gzip.Reader holds nothing to close)
	br    *bufio.Reader
	off   int64
	// size is the decompressed size when known (a zip's entries), else
	// the file's size; for progress only.
	size int64
	done int64 // bytes of the entries before the current one
}

func openInput(path string, from pos) (*input, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	in := &input{f: f}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	in.size = fi.Size()
	var magic [4]byte
	n, _ := io.ReadFull(f, magic[:])
	if n == 4 && (string(magic[:]) == "PK\x03\x04" || string(magic[:]) == "PK\x05\x06") { // a zip (maybe empty)
		zr, err := zip.NewReader(f, fi.Size())
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		in.zr = zr
		in.size = 0
		for _, zf := range zr.File {
			if !zf.FileInfo().IsDir() {
				in.files = append(in.files, zf)
				in.size += int64(zf.UncompressedSize64)
			}
		}
		in.entry = from.Entry
		for _, zf := range in.files[:min(from.Entry, len(in.files))] {
			in.done += int64(zf.UncompressedSize64)
		}
		if err := in.openEntry(from.Offset); err != nil {
			in.close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return in, nil
	}
	if from.Entry != 0 {
		f.Close()
		return nil, fmt.Errorf("%s: the state names zip entry %d of a file that is not a zip: it changed", path, from.Entry)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	if err := in.start(f, from.Offset, true); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return in, nil
}

// openEntry opens the current zip entry at offset off (nothing to open past
// the last entry).
func (in *input) openEntry(off int64) error {
	if in.entry >= len(in.files) {
		return nil
	}
	rc, err := in.files[in.entry].Open()
	if err != nil {
		return fmt.Errorf("entry %s: %w", in.files[in.entry].Name, err)
	}
	in.rc = rc
	return in.start(rc, off, false)
}

// start reads r (gunzipped when it starts with gzip's magic) from offset
// off of its decompressed text; seekable says r is a plain *os.File.
func (in *input) start(r io.Reader, off int64, seekable bool) error {
	br := bufio.NewReaderSize(r, 1<<16)
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		br = bufio.NewReaderSize(gz, 1<<16)
		seekable = false
	}
	if off > 0 {
		if seekable {
			if _, err := in.f.Seek(off, io.SeekStart); err != nil {
				return err
			}
			br.Reset(in.f)
		} else if _, err := io.CopyN(io.Discard, br, off); err != nil {
			return fmt.Errorf("skipping to offset %d: %w (the file changed since the last run)", off, err)
		}
	}
	in.br, in.off = br, off
	return nil
}

// next returns the next non-blank line, or io.EOF after the last one.
func (in *input) next() (line, error) {
	for {
		if in.br == nil {
			return line{}, io.EOF
		}
		at := pos{in.entry, in.off}
		b, err := readLine(in.br)
		in.off += int64(len(b))
		if len(bytes.TrimSpace(b)) > 0 {
			if err != nil && !errors.Is(err, io.EOF) {
				return line{}, err
			}
			return line{at: at, next: pos{in.entry, in.off}, text: b}, nil
		}
		if errors.Is(err, io.EOF) {
			if in.zr == nil || in.entry+1 >= len(in.files) {
				if in.zr != nil { // past the last entry
					in.entry, in.off = len(in.files), 0
				}
				in.br = nil
				return line{}, io.EOF
			}
			if in.rc != nil {
				in.rc.Close()
				in.rc = nil
			}
			in.done += int64(in.files[in.entry].UncompressedSize64)
			in.entry++
			if err := in.openEntry(0); err != nil {
				return line{}, err
			}
			continue
		}
		if err != nil {
			return line{}, err
		}
	}
}

// readLine reads one line including its '\n' (the last may lack it).
func readLine(br *bufio.Reader) ([]byte, error) {
	b, err := br.ReadSlice('\n')
	if !errors.Is(err, bufio.ErrBufferFull) {
		return b, err
	}
	long := append([]byte(nil), b...)
	for errors.Is(err, bufio.ErrBufferFull) {
		if len(long) > maxLine {
			return nil, fmt.Errorf("a line longer than %d bytes: not JSON lines", maxLine)
		}
		b, err = br.ReadSlice('\n')
		long = append(long, b...)
	}
	return long, err
}

// ReadLines calls fn with each non-blank line of the input at path (JSON
// lines, plain or gzipped, or a zip archive of such files), in order, with
// its newline when it has one; a line is valid until fn returns.
func ReadLines(path string, fn func(line []byte) error) error {
	in, err := openInput(path, pos{})
	if err != nil {
		return err
	}
	defer in.close()
	for {
		l, err := in.next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err == nil {
			err = fn(l.text)
		}
		if err != nil {
			return err
		}
	}
}

// progress returns the bytes read and the input's size, for the ETA.
func (in *input) progress() (read, size int64) { return in.done + in.off, in.size }

func (in *input) close() {
	if in.rc != nil {
		in.rc.Close()
	}
	in.f.Close()
}

// Fields of an exported record (the export API's "Exported event record")
// that ingestion takes, under the ingestion field's name.
var exportRenamed = map[string]string{
	"$insert_id":     "insert_id",
	"ip_address":     "ip",
	"device_carrier": "carrier",
	"version_name":   "app_version",
}

// exportKept are the exported fields ingestion takes as they are.
var exportKept = map[string]bool{
	"user_id": true, "device_id": true, "event_type": true, "event_id": true, "session_id": true,
	"event_properties": true, "user_properties": true, "groups": true, "group_properties": true,
	"platform": true, "os_name": true, "os_version": true, "device_brand": true,
	"device_manufacturer": true, "device_model": true, "country": true, "region": true, "city": true,
	"dma": true, "language": true, "location_lat": true, "location_lng": true,
	"price": true, "quantity": true, "revenue": true, "productId": true, "revenueType": true,
	"idfa": true, "idfv": true, "adid": true, "android_id": true,
}

// exportMarkers are fields only an exported record has: a line with one of
// them is mapped; any other object is an HTTP V2 event as it is.
var exportMarkers = []string{"$insert_id", "event_time", "server_upload_time", "uuid", "svc_id"}

// exportTimeLayouts are the forms of the export's UTC ISO 8601 timestamps.
var exportTimeLayouts = []string{"2006-01-02 15:04:05.999999", "2006-01-02T15:04:05.999999Z07:00", "2006-01-02T15:04:05.999999"}

// parseExportTime parses an exported timestamp (UTC when it names no zone).
func parseExportTime(s string) (time.Time, bool) {
	for _, l := range exportTimeLayouts {
		if t, err := time.ParseInLocation(l, s, time.UTC); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}

// events decodes one input line into the ingestion events it holds: the
// events of an envelope ({"events": [...]}), an exported record mapped to
// an ingestion event, or an HTTP V2 event as it is. Every event gets an
// insert_id: its own, else one derived from the line's text and its position
// (so that reading the same file again gives the same ids). dropped counts
// the exported fields ingestion does not take, by name. A line that is not
// a JSON object (or an envelope whose events are not objects) is an error,
// reported as a dead letter by the caller.
func events(l line, dropped map[string]int64) ([][]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(l.text, &obj); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	var objs []map[string]json.RawMessage
	if raw, ok := obj["events"]; ok && obj["event_type"] == nil {
		var evs []json.RawMessage
		if err := json.Unmarshal(raw, &evs); err != nil {
			return nil, fmt.Errorf("envelope: events is not an array: %w", err)
		}
		for i, e := range evs {
			var o map[string]json.RawMessage
			if err := json.Unmarshal(e, &o); err != nil || o == nil {
				return nil, fmt.Errorf("envelope: event %d is not an object", i)
			}
			objs = append(objs, o)
		}
	} else if slices.ContainsFunc(exportMarkers, func(k string) bool { return obj[k] != nil }) {
		objs = append(objs, fromExport(obj, dropped))
	} else {
		objs = append(objs, obj)
	}
	out := make([][]byte, 0, len(objs))
	for i, o := range objs {
		if s, ok := stringOf(o["insert_id"]); !ok || s == "" {
			o["insert_id"] = json.RawMessage(strconv.Quote(derivedID(l, i)))
		}
		if ip, _ := stringOf(o["ip"]); ip == "$remote" {
			delete(o, "ip") // there is no client address to fill in
		}
		b, err := json.Marshal(o)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// fromExport maps an exported record to an ingestion event: renamed and kept
// fields, event_time (else client_event_time) as time in ms; every other
// field is dropped and counted.
func fromExport(obj map[string]json.RawMessage, dropped map[string]int64) map[string]json.RawMessage {
	ev := make(map[string]json.RawMessage, len(obj))
	for k, v := range obj {
		switch {
		case string(v) == "null":
			// absent
		case exportKept[k]:
			ev[k] = v
		case exportRenamed[k] != "":
			ev[exportRenamed[k]] = v
		case k == "event_time" || k == "client_event_time":
			// below
		default:
			dropped[k]++
		}
	}
	times := []string{"event_time", "client_event_time"}
	used := ""
	for _, k := range times {
		if s, ok := stringOf(obj[k]); ok {
			if t, ok := parseExportTime(s); ok {
				ev["time"] = json.RawMessage(strconv.FormatInt(t.UnixMilli(), 10))
				used = k
				break
			}
		}
	}
	for _, k := range times {
		if v, ok := obj[k]; ok && k != used && string(v) != "null" {
			dropped[k]++
		}
	}
	return ev
}

// derivedID is the insert_id of the i-th event of a line that has none: a
// hash of the line's text and its position, so the same file read again
// gives the same ids and two equal lines at different places differ.
func derivedID(l line, i int) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d:%d:%d\n", l.at.Entry, l.at.Offset, i)
	h.Write(bytes.TrimSpace(l.text))
	return "bf-" + hex.EncodeToString(h.Sum(nil)[:16])
}

func stringOf(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// DroppedSummary lists the dropped fields and their counts, most first.
func (c Counts) DroppedSummary() string {
	keys := slices.Sorted(maps.Keys(c.Dropped))
	slices.SortStableFunc(keys, func(a, b string) int { return cmp.Compare(c.Dropped[b], c.Dropped[a]) })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, c.Dropped[k])
	}
	return strings.Join(parts, ", ")
}
