"""Cost model of Ostinato (Section 3.2, Appendix B): Eq. (1), Props 3.1/3.2/B.2, calibration fits, machine profiles."""
