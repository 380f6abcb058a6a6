"""fleet_shell: the desktop face of fleet-rlm (``fleet desktop``, optional extra ``desktop``).

A native pywebview window around the web app of ``fleet_rlm.web`` (composed through its public
factory ``create_app``), served on a random loopback port with a token minted per launch and
handed to the page through the JS bridge. No business logic lives here: the window, its
native touches (title, icon, remembered size, external links, downloads, one instance) and a
self-test.
"""
