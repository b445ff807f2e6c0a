package modal

// RouterConns is how many router connections d keeps open.
func RouterConns(d *Driver) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.routers)
}
