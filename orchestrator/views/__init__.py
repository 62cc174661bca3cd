"""Consumers of the event stream: the job's state as the views see it (jobstate, eta), the terminal progress
(progress, with its figures in words: words), the live browser feed (feed, feedstate) and the run as a picture
(timeline)."""
