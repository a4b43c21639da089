"""Authorization with Kafka's ACLs (issue 30).

``acl``: the pure decision core (resources, patterns, operations, the authorizer and its decision
cache); ``principal``: principals from SASL users and TLS subjects (ssl.principal.mapping.rules);
``gate``: the one authorization point of the request path.
"""
