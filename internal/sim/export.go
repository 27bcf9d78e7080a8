package sim

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Export route rules (GET /api/2/export; docs/upstream-api.md, Export):
//
//   - start and end are YYYYMMDDTHH (UTC), end's hour included; missing or
//     malformed, end before start, or more than ExportMaxRange: 400.
//   - The archive holds the events the api key (the Basic user name) sent to
//     /2/httpapi whose server upload time (Ingested.Time) falls in the range,
//     one zip entry "APP/APP_YYYY-MM-DD_H#0.json" per hour with data, one
//     exported record (ExportRecord) per line, deflated; plus, when
//     configured (Knobs.ExportSyntheticBytes), synthetic records of
//     that many bytes (rounded up to whole blocks of about 1 MiB of whole
//     lines) per hour of the range, in stored (uncompressed) entries
//     "APP/APP_YYYY-MM-DD_H#sN.json" of at most 256 blocks each, generated
//     on the fly from one repeated block.
//   - An estimated uncompressed size above Knobs.ExportMaxBytes (default
//     4 GiB, the document's "4 GB"): 400. No data in the range: 404.
//   - The archive is streamed (chunked); nothing of it is buffered.
//
// Read-out: GET /sim/export/log (the ranges served, in order).

// ExportMaxRange is the longest export range.
const ExportMaxRange = 365 * 24 * time.Hour

// ExportHourFormat is the form of start and end.
const ExportHourFormat = "20060102T15"

// ExportTimeFormat is the form of the timestamps of exported records.
const ExportTimeFormat = "2006-01-02 15:04:05.000000"

// ExportServed is one entry of the export log.
type ExportServed struct {
	Start  string `json:"start"`
	End    string `json:"end"`
	Status int    `json:"status"`
	// Bytes is the archive size sent (0 for non-200 answers).
	Bytes int64 `json:"bytes"`
}

// ExportRecord is one exported event (the document's Exported event
// record; fields the simulator has no value for are left out).
type ExportRecord struct {
	App                int64           `json:"app"`
	SvcID              int64           `json:"svc_id"`
	EventID            int64           `json:"event_id"`
	SessionID          int64           `json:"session_id"`
	UUID               string          `json:"uuid"`
	InsertID           string          `json:"$insert_id,omitempty"`
	EventType          string          `json:"event_type"`
	UserID             string          `json:"user_id,omitempty"`
	DeviceID           string          `json:"device_id,omitempty"`
	EventTime          string          `json:"event_time"`
	ClientEventTime    string          `json:"client_event_time"`
	ClientUploadTime   string          `json:"client_upload_time"`
	ServerReceivedTime string          `json:"server_received_time"`
	ServerUploadTime   string          `json:"server_upload_time"`
	ProcessedTime      string          `json:"processed_time"`
	Platform           string          `json:"platform,omitempty"`
	OSName             string          `json:"os_name,omitempty"`
	OSVersion          string          `json:"os_version,omitempty"`
	Country            string          `json:"country,omitempty"`
	Language           string          `json:"language,omitempty"`
	IPAddress          string          `json:"ip_address,omitempty"`
	EventProperties    json.RawMessage `json:"event_properties"`
	UserProperties     json.RawMessage `json:"user_properties"`
	Groups             json.RawMessage `json:"groups"`
	GroupProperties    json.RawMessage `json:"group_properties"`
	Data               json.RawMessage `json:"data"`
	SampleRate         *int            `json:"sample_rate"`
}

func (s *Sim) registerExport() {
	var log []ExportServed
	s.apiRoute("GET /api/2/export", func(w http.ResponseWriter, r *http.Request, key string) (status int, body any) {
		q := r.URL.Query()
		served := ExportServed{Start: q.Get("start"), End: q.Get("end")}
		defer func() {
			served.Status = status
			s.mu.Lock()
			log = append(log, served)
			s.mu.Unlock()
		}()
		start, err1 := time.Parse(ExportHourFormat, served.Start)
		end, err2 := time.Parse(ExportHourFormat, served.End)
		switch {
		case err1 != nil || err2 != nil:
			return apiFail(http.StatusBadRequest, "start and end must be of the form YYYYMMDDTHH")
		case end.Before(start):
			return apiFail(http.StatusBadRequest, "end is before start")
		case end.Add(time.Hour).Sub(start) > ExportMaxRange:
			return apiFail(http.StatusBadRequest, "the range is longer than 365 days")
		}
		s.mu.Lock()
		maxBytes, synthetic := s.knobs.ExportMaxBytes, s.knobs.ExportSyntheticBytes
		s.mu.Unlock()
		hours := int64(end.Sub(start)/time.Hour) + 1
		byHour, size := exportLines(s.Events(key), func(ev Ingested) bool { return !ev.Time.Before(start) && ev.Time.Before(end.Add(time.Hour)) },
			func(t time.Time) int64 { return t.Truncate(time.Hour).Unix() })
		app := appID(key)
		var block []byte
		var blocksPerHour int64
		if synthetic > 0 {
			block = syntheticBlock(app)
			blocksPerHour = (synthetic + int64(len(block)) - 1) / int64(len(block))
		}
		size += blocksPerHour * int64(len(block)) * hours
		switch {
		case size > maxBytes:
			return apiFail(http.StatusBadRequest, fmt.Sprintf("the result would exceed %d bytes: choose a smaller range", maxBytes))
		case size == 0:
			return apiFail(http.StatusNotFound, "no data for the range")
		}
		w.Header().Set("Content-Type", "application/zip")
		cw := &countWriter{w: w}
		zw := zip.NewWriter(cw)
		// file adds the entry name of hour h holding chunks, repeat times.
		file := func(h time.Time, name string, method uint16, repeat int64, chunks ...[]byte) error {
			f, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: method, Modified: h})
			for ; err == nil && repeat > 0; repeat-- {
				for _, c := range chunks {
					if _, err = f.Write(c); err != nil {
						break
					}
				}
			}
			return err
		}
		for h := start; !h.After(end); h = h.Add(time.Hour) {
			prefix := fmt.Sprintf("%d/%d_%s_%d#", app, app, h.Format("2006-01-02"), h.Hour())
			if lines := byHour[h.Unix()]; len(lines) > 0 && file(h, prefix+"0.json", zip.Deflate, 1, lines...) != nil {
				return http.StatusOK, written{} // the client went away
			}
			for n, left := 0, blocksPerHour; left > 0; n++ {
				part := min(left, 256) // blocks of about 1 MiB
				left -= part
				if file(h, prefix+"s"+strconv.Itoa(n)+".json", zip.Store, part, block) != nil {
					return http.StatusOK, written{}
				}
			}
		}
		zw.Close()
		served.Bytes = cw.n
		return http.StatusOK, written{}
	})
	s.readout("GET /sim/export/log", func(url.Values) any { return map[string]any{"served": nonNil(log)} })
}

// exportLines returns the exported records (lines ending in '\n') of the
// events of evs that keep takes, by group of their upload time (UTC), and
// their total size.
func exportLines[K comparable](evs []Ingested, keep func(Ingested) bool, group func(time.Time) K) (map[K][][]byte, int64) {
	out := make(map[K][][]byte)
	var size int64
	for _, ev := range evs {
		if keep(ev) {
			line := append(exportLine(ev), '\n')
			k := group(ev.Time.UTC())
			out[k] = append(out[k], line)
			size += int64(len(line))
		}
	}
	return out, size
}

// exportLine is the exported record (JSON, no newline) of a stored event.
func exportLine(ev Ingested) []byte {
	// The fields an event names as a record does (ids, platform, country,
	// properties) are read into it; the others are set below. The event
	// was validated when ingested.
	var rec ExportRecord
	json.Unmarshal(ev.Raw, &rec)
	var in struct {
		Time *int64 `json:"time"`
		IP   string `json:"ip"`
	}
	json.Unmarshal(ev.Raw, &in)
	up := ev.Time.UTC().Format(ExportTimeFormat) // the upload time
	evTime := up                                 // the event's own time, else its upload time
	if in.Time != nil {
		evTime = time.UnixMilli(*in.Time).UTC().Format(ExportTimeFormat)
	}
	for _, b := range []*json.RawMessage{&rec.EventProperties, &rec.UserProperties, &rec.Groups, &rec.GroupProperties} {
		if len(*b) == 0 || string(*b) == "null" {
			*b = json.RawMessage("{}")
		}
	}
	rec.App, rec.SvcID = appID(ev.APIKey), SvcID(ev.APIKey, ev.UserID+"\x00"+ev.DeviceID)
	if ev.UserID != "" {
		rec.SvcID = SvcID(ev.APIKey, ev.UserID)
	}
	rec.UUID = fmt.Sprintf("00000000-0000-4000-8000-%012d", ev.Seq%1_000_000_000_000)
	rec.InsertID, rec.EventType, rec.UserID, rec.DeviceID = ev.InsertID, ev.EventType, ev.UserID, ev.DeviceID
	rec.EventTime, rec.ClientEventTime = evTime, evTime
	rec.ClientUploadTime, rec.ServerReceivedTime, rec.ServerUploadTime, rec.ProcessedTime = up, up, up, up
	rec.IPAddress, rec.Data, rec.SampleRate = in.IP, json.RawMessage("{}"), nil
	b, _ := json.Marshal(rec)
	return b
}

// syntheticBlock is about 1 MiB of synthetic exported records, whole lines.
func syntheticBlock(app int64) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < 1<<20; i++ {
		fmt.Fprintf(&b, `{"app":%d,"svc_id":%d,"event_type":"synthetic","$insert_id":"syn-%07d","user_id":"user-%05d",`+
			`"server_upload_time":"2020-01-01 00:00:00.000000","event_properties":{"n":%d},"data":{}}`+"\n",
			app, 1000+i%977, i, i%977, i)
	}
	return b.Bytes()
}

type countWriter struct {
	w interface{ Write([]byte) (int, error) }
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}
