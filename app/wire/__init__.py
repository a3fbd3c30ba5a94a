"""Byte formats below the services: encoding and decoding what travels over a socket, with no
service call in them. A way in (the Kafka gateway, ``api.kafka``) and a service
(``app.services.kafka_groups``, through the admin client) both use them.
"""
