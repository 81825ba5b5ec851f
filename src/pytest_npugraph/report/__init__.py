"""What the plugin shows people: timelines (Chrome trace JSON) and reports."""
