package admission

// MemoryShort reports whether the edge's memory is past its high-water
// mark, for work that may wait or be skipped until it is not (compressing
// a response holds an encoder's window). A nil Controller is never short.
func (c *Controller) MemoryShort() bool {
	return c != nil && c.memHigh.Load()
}
