package simtest

// CountEvents counts the elements of the top-level "events" array of a JSON
// envelope with a cheap scan (no validation; malformed input gives some
// count, never a panic).
func CountEvents(body []byte) int {
	depth := 0
	lastKey := ""
	inEvents := false
	n := 0
	sawValue := false
	for i := 0; i < len(body); i++ {
		switch c := body[i]; c {
		case '"':
			end := stringEnd(body, i)
			if depth == 1 && !inEvents && end < len(body) {
				lastKey = string(body[i+1 : end])
			}
			if inEvents && depth == 2 {
				sawValue = true
			}
			i = end
		case '{', '[':
			if depth == 1 && c == '[' && lastKey == "events" {
				inEvents = true
				sawValue = false
			} else if inEvents && depth == 2 {
				sawValue = true
			}
			depth++
		case '}', ']':
			depth--
			if inEvents && depth == 1 {
				if sawValue {
					n++
				}
				inEvents = false
				lastKey = ""
			}
		case ',':
			if inEvents && depth == 2 {
				n++
			} else if depth == 1 {
				lastKey = ""
			}
		case ' ', '\t', '\n', '\r', ':':
		default:
			if inEvents && depth == 2 {
				sawValue = true
			}
		}
	}
	return n
}

// stringEnd returns the index of the quote that closes the JSON string
// opening at b[i], or len(b) when it is not closed.
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return len(b)
}
