package operator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/svcrelay/relay/internal/forward"
)

// feedbackCmd is `relay feedback`: it sends the items of a JSON-lines file
// (one item object a line; blank lines skipped) to a feedback source, in
// requests of at most 100 items and 5 MB. Items breaking the documented
// rules (conversation parts nested or without a body, not a JSON object, too
// large for a request of their own) are reported and not sent; the
// upstream's per-item errors are reported as they come. Each report line on
// stdout is "error\tLINE\tUNIQUE_ID\tTEXT". Exit 1 when any item failed.
func feedbackCmd(fs *flag.FlagSet, c *common, stdout io.Writer) work {
	source := fs.String("source", "", "feedback source id (from the source's settings); required")
	file := fs.String("file", "", "JSON lines file of items; required")
	return func(ctx context.Context, p *progress) error {
		if err := required(fs, "source", "file"); err != nil {
			return err
		}
		cl, base, err := c.projectClient()
		if err != nil {
			return err
		}
		items, lineOf, failed, err := readFeedbackItems(*file, stdout)
		if err != nil {
			return err
		}
		bodies, members, tooLarge := forward.ChunkFeedback(*source, items, 0)
		for _, i := range tooLarge {
			id, _ := forward.CheckFeedbackItem(items[i])
			fmt.Fprintf(stdout, "error\t%d\t%s\t%s\n", lineOf[i], id, "item larger than a whole request (5 MB): not sent")
			failed++
		}
		ingested := 0
		for n, body := range bodies {
			p.update("request %d of %d (%d items)", n+1, len(bodies), len(members[n]))
			resp, err := cl.do(ctx, http.MethodPost, base+forward.FeedbackPath, body, true)
			if err != nil {
				return fmt.Errorf("request %d of %d (lines %d to %d): %w (earlier requests were sent; items are upserted by unique_id, so running again is safe)",
					n+1, len(bodies), lineOf[members[n][0]], lineOf[members[n][len(members[n])-1]], err)
			}
			var ans forward.FeedbackAnswer
			err = json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&ans)
			resp.Body.Close()
			if err != nil {
				return fmt.Errorf("request %d of %d: the answer is not JSON: %w", n+1, len(bodies), err)
			}
			ingested += ans.Ingested
			failed += ans.Failed
			// Map unique_ids back to lines for the report.
			lines := make(map[string]int, len(members[n]))
			for _, i := range members[n] {
				if id, _ := forward.CheckFeedbackItem(items[i]); id != "" {
					lines[id] = lineOf[i]
				}
			}
			for _, e := range ans.Errors {
				fmt.Fprintf(stdout, "error\t%d\t%s\t%s\n", lines[e.UniqueID], e.UniqueID, e.Error)
			}
			p.logf("request %d of %d: %d items ingested, %d failed", n+1, len(bodies), ans.Ingested, ans.Failed)
		}
		p.logf("%d items ingested, %d failed, in %d requests", ingested, failed, len(bodies))
		if failed > 0 {
			return ErrFailed
		}
		return nil
	}
}

// readFeedbackItems reads the items; items breaking the rules are reported
// on stdout and counted in failed.
func readFeedbackItems(path string, stdout io.Writer) (items []json.RawMessage, lineOf []int, failed int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, 0, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	for n := 1; ; n++ {
		line, rerr := br.ReadBytes('\n') // a new slice each time: items keep it
		if item := json.RawMessage(bytes.Trim(line, " \t\r\n")); len(item) > 0 {
			if id, cerr := forward.CheckFeedbackItem(item); cerr != nil {
				fmt.Fprintf(stdout, "error\t%d\t%s\t%s (not sent)\n", n, id, cerr)
				failed++
			} else {
				items = append(items, item)
				lineOf = append(lineOf, n)
			}
		}
		if rerr == io.EOF {
			return items, lineOf, failed, nil
		}
		if rerr != nil {
			return nil, nil, 0, rerr
		}
	}
}
