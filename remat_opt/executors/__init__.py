"""Thunder operator executors shipped with remat-opt."""
