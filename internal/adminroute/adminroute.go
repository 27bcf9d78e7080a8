// Package adminroute is the one type shared by the packages that offer routes
// to the admin listener (group identify, user mapping, the forwarded
// management APIs) and the listener that serves them. A package returns its
// routes; internal/adminapi applies the admin-token check of Mode (see
// internal/admintoken) before calling Handler, so handlers never see an
// unauthenticated request.
package adminroute

import (
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/valyala/fasthttp"
)

// Route is one method and path on the admin listener.
type Route struct {
	// Method is the HTTP method, e.g. fasthttp.MethodGet.
	Method string
	// Path is matched exactly, or as a prefix when it ends in "/" (the
	// longest registered match wins); handlers of a prefix route their
	// sub-paths themselves.
	Path string
	// Mode says where the admin token travels: admintoken.ModeOwn for the
	// relay's own routes, admintoken.ModeForward for routes whose caller
	// may pass its own upstream Authorization through.
	Mode admintoken.Mode
	// Handler serves the request after the token check; the admin token
	// headers have already been stripped.
	Handler fasthttp.RequestHandler
}
