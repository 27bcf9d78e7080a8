package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// traffic is the nodes' message counts by kind at one moment: what the
// clients (relays, the bench) and the routes carried, and the Raft entries
// committed per group, named by the stream they replicate. Taken before and
// after the measured window, it says which of a batch's node messages are
// the client's publish, the replication, the deliveries and the rest.
type traffic struct {
	clientIn, clientOut, routeIn, routeOut int64
	committed                              map[string]uint64 // by stream name ("meta", "other")
	lastSeq                                map[string]uint64 // messages ever stored, by stream name
}

func getJSON(hc *http.Client, url string, v any) error {
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// addMsgs adds the message counts that the monitor page at url lists (its
// connections or its routes) to in and out; a failed read adds nothing.
func addMsgs(hc *http.Client, url string, in, out *int64) {
	type counts struct {
		InMsgs  int64 `json:"in_msgs"`
		OutMsgs int64 `json:"out_msgs"`
	}
	var page struct {
		Conns  []counts `json:"connections"`
		Routes []counts `json:"routes"`
	}
	if getJSON(hc, url, &page) != nil {
		return
	}
	for _, x := range append(page.Conns, page.Routes...) {
		*in += x.InMsgs
		*out += x.OutMsgs
	}
}

func readTraffic(monitors []int) traffic {
	hc := &http.Client{Timeout: 2 * time.Second}
	t := traffic{committed: make(map[string]uint64), lastSeq: make(map[string]uint64)}
	groupStream := map[string]string{"_meta_": "meta"}
	committed := make(map[string]uint64)
	for _, m := range monitors {
		base := fmt.Sprintf("http://127.0.0.1:%d", m)
		addMsgs(hc, base+"/connz?limit=1000", &t.clientIn, &t.clientOut)
		addMsgs(hc, base+"/routez", &t.routeIn, &t.routeOut)
		var j struct {
			Accounts []struct {
				Name    string `json:"name"`
				Streams []struct {
					Name      string `json:"name"`
					RaftGroup string `json:"stream_raft_group"`
					State     struct {
						LastSeq uint64 `json:"last_seq"`
					} `json:"state"`
				} `json:"stream_detail"`
			} `json:"account_details"`
		}
		if getJSON(hc, base+"/jsz?accounts=true&streams=true&raft=true", &j) == nil {
			for _, a := range j.Accounts {
				for _, s := range a.Streams {
					t.lastSeq[s.Name] = max(t.lastSeq[s.Name], s.State.LastSeq)
					if s.RaftGroup != "" {
						groupStream[s.RaftGroup] = s.Name
					}
				}
			}
		}
		accs := []string{""} // the system account's: the meta group
		for _, a := range j.Accounts {
			accs = append(accs, a.Name)
		}
		for _, acc := range accs {
			var z map[string]map[string]struct {
				Committed uint64 `json:"committed"`
			}
			if getJSON(hc, base+"/raftz?acc="+url.QueryEscape(acc), &z) == nil {
				for _, groups := range z {
					for g, x := range groups {
						committed[g] = max(committed[g], x.Committed)
					}
				}
			}
		}
	}
	for g, n := range committed {
		name, ok := groupStream[g]
		if !ok {
			name = "other" // consumers' groups (none of one replica), or a group unnamed yet
		}
		t.committed[name] += n
	}
	return t
}

// trafficLine is the difference b-a per request: client and route messages
// and the Raft entries per stream.
func trafficLine(a, b traffic, reqs float64) string {
	var s strings.Builder
	fmt.Fprintf(&s, "clients in %.3f out %.3f, routes in %.3f out %.3f; raft entries", float64(b.clientIn-a.clientIn)/reqs,
		float64(b.clientOut-a.clientOut)/reqs, float64(b.routeIn-a.routeIn)/reqs, float64(b.routeOut-a.routeOut)/reqs)
	perStream := func(a, b map[string]uint64) {
		for _, n := range slices.Sorted(maps.Keys(b)) {
			if d := b[n] - a[n]; d > 0 && b[n] >= a[n] {
				fmt.Fprintf(&s, " %s %.4f", n, float64(d)/reqs)
			}
		}
	}
	perStream(a.committed, b.committed)
	s.WriteString("; messages stored")
	perStream(a.lastSeq, b.lastSeq)
	return s.String()
}
