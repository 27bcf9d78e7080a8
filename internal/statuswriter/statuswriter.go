// Package statuswriter holds the http.ResponseWriter that keeps the status
// it answered: the admin listener, the forwarders and the upstream
// simulator log or count it, and the simulator must not depend on the
// admin side to do so.
package statuswriter

import "net/http"

// Writer keeps the status of the answer written through it.
type Writer struct {
	http.ResponseWriter
	// Status is the answer's status, 0 until its head is written.
	Status int
}

func (w *Writer) WriteHeader(code int) {
	if w.Status == 0 && code >= 200 {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *Writer) Write(p []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *Writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }
