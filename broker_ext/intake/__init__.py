"""The generator's intake: where each partition's cursor positions come from.

`source` names what a partition and its source say to each other (`CursorSource`, `Followed`); two sources
implement it: the broker plugin's pushed moves (`plugin_cursors`, one long poll per broker) and, where no plugin
reports a topic, the admin API (`admin_polling`: fast polls while a marker waits, the sweep, and `ack_watch` for
late acknowledgements). The engine does not know which one answered.
"""
