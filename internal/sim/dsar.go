package sim

import (
	"bytes"
	"compress/gzip"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// DSAR route rules (docs/upstream-api.md, Data subject access requests):
//
//   - POST /api/2/dsar/requests, JSON {"userId" | "svcId", "startDate",
//     "endDate"} (dates YYYY-MM-DD, start not after end): 202
//     {"requestId": N}; otherwise 400 {"error"}.
//   - GET /api/2/dsar/requests/{id}: each poll moves the job one step:
//     "submitted", "processing", ... and after Knobs.DSARPollsToDone polls
//     "done" with "urls" (or "failed" for a job created while
//     Knobs.DSARFailNext was above 0). The urls are {base}/api/2/dsar/requests/{id}/outputs/{n},
//     one per month of the range in which the user has events (any api key:
//     the DSAR key is the organization's), base taken from the request's
//     Host. A job whose user has no events is done with no urls.
//   - GET .../outputs/{n}: needs the Authorization of the job's creator
//     (else 403); valid for Knobs.DSARURLTTL after the job is done (then
//     410); answers 302 to /objects/dsar/{id}/{n}?expires=UNIX&sig=HMAC (the
//     object storage), which also needs the same Authorization and answers
//     403 once expires (Config.Now) is past; 60 seconds after the redirect.
//   - Output files are gzipped JSON lines, the records of an export
//     (ExportRecord).
//   - Jobs are kept per Sim (closures), not cleared by /sim/reset.

type dsarJob struct {
	id         int64
	auth       string // Authorization of the creator
	userID     string
	svcID      int64
	start, end time.Time
	polls      int
	fail       bool
	doneAt     time.Time
	files      [][]byte // gzipped outputs, set when done
}

func (s *Sim) registerDSAR() {
	nextID, jobs := int64(1000), map[int64]*dsarJob{}
	sigKey := make([]byte, 32)
	rand.Read(sigKey)
	// jobOf returns the job named by the path's {id}; s.mu held.
	jobOf := func(r *http.Request) *dsarJob {
		id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64) // 0 when not a number: no job's
		return jobs[id]
	}
	sign := func(path, exp string) string {
		m := hmac.New(sha256.New, sigKey)
		m.Write([]byte(path + "?" + exp))
		return hex.EncodeToString(m.Sum(nil)[:16])
	}
	s.apiRoute("POST /api/2/dsar/requests", func(w http.ResponseWriter, r *http.Request, key string) (int, any) {
		var req struct {
			UserID    string          `json:"userId"`
			SvcID     json.RawMessage `json:"svcId"`
			StartDate string          `json:"startDate"`
			EndDate   string          `json:"endDate"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
			return apiFail(http.StatusBadRequest, "invalid JSON body")
		}
		job := &dsarJob{auth: r.Header.Get("Authorization"), userID: req.UserID}
		if len(req.SvcID) > 0 && string(req.SvcID) != "null" {
			n, err := strconv.ParseInt(string(bytes.Trim(req.SvcID, `"`)), 10, 64)
			if err != nil || n <= 0 {
				return apiFail(http.StatusBadRequest, "svcId must be a positive integer")
			}
			job.svcID = n
		}
		var err1, err2 error
		job.start, err1 = time.Parse(time.DateOnly, req.StartDate)
		job.end, err2 = time.Parse(time.DateOnly, req.EndDate)
		switch {
		case job.userID == "" && job.svcID == 0:
			return apiFail(http.StatusBadRequest, "userId or svcId is required")
		case err1 != nil || err2 != nil:
			return apiFail(http.StatusBadRequest, "startDate and endDate must be YYYY-MM-DD")
		case job.end.Before(job.start):
			return apiFail(http.StatusBadRequest, "endDate is before startDate")
		}
		s.mu.Lock()
		job.id = nextID
		nextID++
		if s.knobs.DSARFailNext > 0 {
			s.knobs.DSARFailNext--
			job.fail = true
		}
		jobs[job.id] = job
		s.mu.Unlock()
		return http.StatusAccepted, map[string]int64{"requestId": job.id}
	})
	s.apiRoute("GET /api/2/dsar/requests/{id}", func(w http.ResponseWriter, r *http.Request, key string) (int, any) {
		s.mu.Lock()
		job := jobOf(r)
		if job == nil {
			s.mu.Unlock()
			return apiFail(http.StatusNotFound, "no such request")
		}
		job.polls++
		steps := [...]string{"submitted", "processing"}
		status := steps[min(job.polls-1, len(steps)-1)]
		var urls []string
		switch {
		case job.polls >= s.knobs.DSARPollsToDone && job.fail:
			status = "failed"
		case job.polls >= s.knobs.DSARPollsToDone:
			status = "done"
			if job.files == nil {
				job.doneAt = s.cfg.Now()
				s.mu.Unlock()
				files := s.dsarFiles(job)
				s.mu.Lock()
				job.files = files
			}
			urls = []string{}
			for n := range job.files {
				urls = append(urls, "http://"+r.Host+"/api/2/dsar/requests/"+strconv.FormatInt(job.id, 10)+"/outputs/"+strconv.Itoa(n))
			}
		}
		s.mu.Unlock()
		body := map[string]any{"requestId": job.id, "status": status}
		if urls != nil {
			body["urls"] = urls
		}
		return http.StatusOK, body
	})
	s.apiRoute("GET /api/2/dsar/requests/{id}/outputs/{n}", func(w http.ResponseWriter, r *http.Request, key string) (int, any) {
		s.mu.Lock()
		job := jobOf(r)
		n, err := strconv.Atoi(r.PathValue("n"))
		var status int
		var msg string
		switch {
		case job == nil || err != nil || job.files == nil || n < 0 || n >= len(job.files):
			status, msg = http.StatusNotFound, "no such output"
		case !hmac.Equal([]byte(r.Header.Get("Authorization")), []byte(job.auth)):
			status, msg = http.StatusForbidden, "the output needs the credentials that created the request"
		case s.cfg.Now().After(job.doneAt.Add(s.knobs.DSARURLTTL)):
			status, msg = http.StatusGone, "the output has expired"
		}
		var loc string
		if status == 0 {
			exp := strconv.FormatInt(s.cfg.Now().Add(60*time.Second).Unix(), 10)
			path := "/objects/dsar/" + strconv.FormatInt(job.id, 10) + "/" + strconv.Itoa(n)
			loc = "http://" + r.Host + path + "?expires=" + exp + "&sig=" + sign(path, exp)
		}
		s.mu.Unlock()
		if status != 0 {
			return apiFail(status, msg)
		}
		http.Redirect(w, r, loc, http.StatusFound)
		return http.StatusFound, written{}
	})
	s.apiRoute("GET /objects/dsar/{id}/{n}", func(w http.ResponseWriter, r *http.Request, key string) (int, any) {
		exp := r.URL.Query().Get("expires")
		expUnix, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || !hmac.Equal([]byte(r.URL.Query().Get("sig")), []byte(sign(r.URL.Path, exp))) {
			return apiFail(http.StatusForbidden, "signature does not match")
		}
		if s.cfg.Now().Unix() > expUnix {
			return apiFail(http.StatusForbidden, "request has expired")
		}
		s.mu.Lock()
		job := jobOf(r)
		n, _ := strconv.Atoi(r.PathValue("n"))
		var file []byte
		ok := job != nil && n >= 0 && n < len(job.files) && hmac.Equal([]byte(r.Header.Get("Authorization")), []byte(job.auth))
		if ok {
			file = job.files[n]
		}
		s.mu.Unlock()
		if !ok {
			return apiFail(http.StatusForbidden, "the output needs the credentials that created the request")
		}
		w.Header().Set("Content-Type", "application/gzip")
		w.Header().Set("Content-Length", strconv.Itoa(len(file)))
		w.Write(file)
		return http.StatusOK, written{}
	})
}

// dsarFiles builds the gzipped outputs of job: one per month with events of
// its user (server upload time within the job's dates, end day included).
func (s *Sim) dsarFiles(job *dsarJob) [][]byte {
	to := job.end.AddDate(0, 0, 1)
	months, _ := exportLines(s.AllEvents(), func(ev Ingested) bool {
		return ev.UserID != "" && !ev.Time.Before(job.start) && ev.Time.Before(to) &&
			(job.userID == "" || ev.UserID == job.userID) && (job.svcID == 0 || SvcID(ev.APIKey, ev.UserID) == job.svcID)
	}, func(t time.Time) string { return t.Format("2006-01") })
	files := [][]byte{}
	for _, m := range sortedKeys(months) {
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		for _, line := range months[m] {
			zw.Write(line)
		}
		zw.Close()
		files = append(files, gz.Bytes())
	}
	return files
}
