// Package admission owns the edge's resource budget and who may spend it:
// how many connections (client and upstream, each a descriptor) the edge
// takes on, what it sheds under pressure and in which order, and the fair
// shares that keep one application or one client address from taking the
// box from everyone else. Every rule, its constant and why are in
// docs/design.md, "Admission: every rule in one table".
//
// Derive computes the budget from the process's limits; a Controller
// enforces it on the listeners (Listener, PlainListener, QUICListener, and
// AdminListener with a pool of its own), on each request (Admit), on each
// upstream dial (DialUpstream), and in its monitor (Run), which sheds under
// pressure. It does not know about routing or how bytes reach an upstream:
// the edge's handler names the application, and backhaul hands over the
// connections it dials to be counted.
package admission
