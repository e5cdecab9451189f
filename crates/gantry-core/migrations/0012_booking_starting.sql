-- Version 12: when a booking's owner was told it starts soon (`booking_starting`), so the notice is
-- sent once per booking, across engine restarts.
ALTER TABLE bookings ADD COLUMN starting_notified_ms INTEGER;
