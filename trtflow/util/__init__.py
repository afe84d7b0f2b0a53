"""Small leaf utilities (files, compute capabilities, tool versions, settings) that import nothing above them."""
