"""Who is calling and what they may do, for both doors: host names, browsers on other sites,
tokens and the tailnet's identity, roles, lanes, connection caps."""
