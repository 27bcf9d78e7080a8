package event

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// MaxAPIKeyBytes bounds an envelope's api_key (unescaped). The upstream's
// keys are 32 hex characters; a longer one is answered like any key the
// upstream refuses, 400 "Invalid API key", before anything is spooled: each
// distinct key is a lane, and a lane's key is kept in memory, in the spool
// and in every request sent for it.
const MaxAPIKeyBytes = 128

// apiKeyTooLong reports whether the api_key string content s (escaped when
// esc) is longer than MaxAPIKeyBytes once unescaped.
func apiKeyTooLong(s []byte, esc bool) bool {
	if !esc || len(s) <= MaxAPIKeyBytes {
		return len(s) > MaxAPIKeyBytes
	}
	if len(s) > 6*MaxAPIKeyBytes { // \uXXXX is the longest escape of one byte's worth
		return true
	}
	var buf [6 * MaxAPIKeyBytes]byte
	return len(appendUnescaped(buf[:0], s)) > MaxAPIKeyBytes
}

// canonicalOptions returns the canonical form of the options object raw
// (valid JSON, an object), appended to dst, or dst unchanged when the
// options say nothing (then the request is sent without options):
//
//   - min_id_length: dropped when null or DefaultMinIDLength (the
//     upstream's default: the same as absent), else the integer minLen;
//   - every other key: kept, with its value re-encoded compactly with
//     object keys sorted at every depth (numbers keep their literal text,
//     strings are re-escaped the one way encoding/json does);
//   - keys sorted; a repeated key counts once, its last value (as the
//     upstream's JSON parser and encoding/json read it).
//
// So two requests whose options mean the same share one lane, and one
// device's events never go through two lanes (whose order would be
// independent) because one sender spaces its options differently.
//
// onlyMin says the object has no key but min_id_length (the SDKs' case):
// then no JSON decoding is needed.
func canonicalOptions(dst, raw []byte, minLen int, onlyMin bool) []byte {
	if onlyMin {
		return appendMinIDLength(dst, minLen)
	}
	var canon map[string]any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&canon); err != nil {
		// Not reached for an object Parse accepted; keep it as sent.
		return append(dst, raw...)
	}
	delete(canon, "min_id_length")
	if len(canon) == 0 {
		return appendMinIDLength(dst, minLen)
	}
	if minLen != DefaultMinIDLength {
		canon["min_id_length"] = json.Number(strconv.Itoa(minLen))
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(canon); err != nil { // maps encode with sorted keys
		return append(dst, raw...)
	}
	return append(dst, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
}

// appendMinIDLength appends {"min_id_length":n}, or nothing when n is the
// default.
func appendMinIDLength(dst []byte, n int) []byte {
	if n == DefaultMinIDLength {
		return dst
	}
	dst = append(dst, `{"min_id_length":`...)
	dst = strconv.AppendInt(dst, int64(n), 10)
	return append(dst, '}')
}
